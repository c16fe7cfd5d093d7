"""Vision-language models: what mlx-vlm adds to a model mlx-lm loads.

The language model is mlx-lm's, as for a text-only model, so an image request batches with
text requests in one ``BatchGenerator``. mlx-vlm supplies the rest: the image processor (a
Hugging Face processor), the vision tower and the merge of image features into the token
embeddings (``get_input_embeddings``). The generation thread prefills an image prompt's
image span from those embeddings itself, then inserts the sequence with its cache
(``vision_prefill.py``).

Invariants:
- An image in a rendered prompt is a run of one *negative* id per image token: ``-handle``,
  where the handle is a hash of the image's decoded pixels and its processor settings. The
  prefix cache keys prompts by these ids, so the same image replayed hits and a different image
  never does; the generation thread swaps them for the model's image token before the model
  sees them. Nothing else reads prompt ids below zero.
- ``prepare`` (the processor, on a worker thread) files what the vision tower needs under the
  handle (``_Registry``, bounded): a cache of the edge's, read by ``render`` and by
  ``images_for`` when the model actor submits the prompt, which puts each image's arrays, as
  plain bytes (``ImageInput``), in the sequence's ``Admit``. The generation thread reads them
  from there only (``vision_prefill``), so a journal replays an image request and every rank of
  a sharded model gets them in the broadcast. An image the registry dropped is prepared again
  from its ``ImageRef`` (``images.py``), which every item that holds it keeps, at the next
  render.
- Rendering, preparing and the registry are plain Python and NumPy (any thread); only
  ``load_vision`` and ``vision_prefill`` call MLX (the generation thread).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..protocol.items.images import ImageRef, holds_images, images_of, text_of
from .inbound import ImageInput, PlainArray

# Decoded images above this many pixels are refused (PIL's own bomb limit is ~89M).
MAX_PIXELS: Final = 40_000_000
MAX_IMAGE_BYTES: Final = 20 << 20
REGISTRY_ENTRIES: Final = 256
# ... and at most this many bytes of pixel arrays (a large Qwen-VL image is tens of MB).
REGISTRY_BYTES: Final = 1 << 30
# Families whose template writes the image placeholder inside vision start/end marks.
_WRAPPED: Final = {
    "qwen2_vl": ("<|vision_start|>", "<|vision_end|>"),
    "qwen2_5_vl": ("<|vision_start|>", "<|vision_end|>"),
    "qwen3_vl": ("<|vision_start|>", "<|vision_end|>"),
    "qwen3_vl_moe": ("<|vision_start|>", "<|vision_end|>"),
}
# Multimodal RoPE (Qwen-VL's row/column positions): prefilled through mlx-vlm's own language
# model, which numbers them so (``vision_prefill``), sharing mlx-lm's weights. Qwen3-VL's
# language model also takes the tower's deepstack features inside its first layers.
MROPE: Final = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
# ``detail: "low"``: at most this many image tokens where the processor has a pixel budget.
LOW_DETAIL_TOKENS: Final = 256


def low_detail_pixels(image_processor: Any) -> int:
    """The pixels ``LOW_DETAIL_TOKENS`` image tokens cover: one token per merged patch
    (28 x 28 pixels on Qwen2-VL, 32 x 32 on Qwen3-VL), but never under the processor's own
    minimum."""
    patch = getattr(image_processor, "patch_size", None)
    merge = getattr(image_processor, "merge_size", None)
    side = patch * merge if isinstance(patch, int) and isinstance(merge, int) else 28
    floor = getattr(image_processor, "min_pixels", None)
    return max(LOW_DETAIL_TOKENS * side * side, floor if isinstance(floor, int) else 0)


class ImageError(ValueError):
    """An image the server cannot take: the message says why (a 400 at the edge)."""


def is_vision_model(path: str) -> bool:
    """A model folder whose config has a vision tower and that ships an image processor."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        return False
    try:
        config = json.loads(config_file.read_text())
    except ValueError:
        return False
    has_processor = any(
        (folder / name).is_file() for name in ("preprocessor_config.json", "processor_config.json")
    )
    return isinstance(config, dict) and "vision_config" in config and has_processor


@dataclass(frozen=True, slots=True)
class Prepared:
    """One image as the model takes it: the processor's arrays and its tokens in a prompt."""

    handle: int
    arrays: Mapping[str, Any]  # NumPy arrays: pixel_values and what the tower needs with them
    tokens: tuple[int, ...]  # its expansion, image positions written as ``-handle``
    # The M-RoPE positions its image tokens take: max(t, h, w) of its merged grid.
    advance: int = 0

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(a, "nbytes", 0)) for a in self.arrays.values())

    def plain(self) -> ImageInput:
        """What an ``Admit`` carries for it: its arrays as bytes (a copy, made once)."""
        arrays = tuple(
            (name, PlainArray(value.dtype.str, tuple(value.shape), value.tobytes()))
            for name, value in sorted(self.arrays.items())
            if isinstance(value, np.ndarray)
        )
        return ImageInput(self.handle, max(1, self.tokens.count(-self.handle)), arrays)


def image_arrays(image: ImageInput) -> dict[str, np.ndarray]:
    """``image``'s arrays back as NumPy arrays (read-only views of its bytes)."""
    return {
        name: np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(a.shape)
        for name, a in image.arrays
    }


class _Registry:
    """Prepared images by handle (and the handle of an image's URL and detail), newest kept."""

    def __init__(self, capacity: int, max_bytes: int = REGISTRY_BYTES) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._by_handle: OrderedDict[int, Prepared] = OrderedDict()
        self._by_url: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._plain: dict[int, ImageInput] = {}
        self._capacity = capacity

    def by_url(self, key: tuple[str, str]) -> Prepared | None:
        with self._lock:
            handle = self._by_url.get(key)
            found = None if handle is None else self._by_handle.get(handle)
            if found is not None:
                self._by_handle.move_to_end(handle)  # type: ignore[arg-type]
            return found

    def get(self, handle: int) -> Prepared | None:
        with self._lock:
            return self._by_handle.get(handle)

    def plain(self, handle: int) -> ImageInput | None:
        """The handle's ``ImageInput``, made once per prepared image and kept with it."""
        with self._lock:
            found = self._plain.get(handle)
            if found is not None or handle not in self._by_handle:
                return found
            prepared = self._by_handle[handle]
        made = prepared.plain()  # the copy outside the lock
        with self._lock:
            if handle in self._by_handle:
                self._plain[handle] = made
        return made

    def put(self, key: tuple[str, str], prepared: Prepared) -> None:
        with self._lock:
            if prepared.handle not in self._by_handle:
                self._bytes += prepared.nbytes
            self._by_handle[prepared.handle] = prepared
            self._by_handle.move_to_end(prepared.handle)
            self._by_url[key] = prepared.handle
            self._by_url.move_to_end(key)
            # The newest always stays: its request is about to be admitted.
            while len(self._by_handle) > 1 and (
                len(self._by_handle) > self._capacity or self._bytes > self._max_bytes
            ):
                dropped, oldest = self._by_handle.popitem(last=False)
                self._bytes -= oldest.nbytes
                self._plain.pop(dropped, None)
            while len(self._by_url) > 4 * self._capacity:
                self._by_url.popitem(last=False)


def decode_data_url(url: str) -> bytes:
    if not url.startswith("data:"):
        raise ImageError("expected a data URL")
    header, _, data = url.partition(",")
    if not header.endswith(";base64"):
        raise ImageError("a data URL must be base64 encoded")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data URL is not valid base64") from None


def open_image(data: bytes) -> Any:
    """The decoded RGB image (PIL), or ``ImageError`` saying why not."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"the image is {len(data)} bytes; the limit is {MAX_IMAGE_BYTES}")
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            if width * height > MAX_PIXELS:
                raise ImageError(
                    f"the image is {width}x{height} pixels; the limit is {MAX_PIXELS} pixels"
                )
            probe.load()
            return probe.convert("RGB")
    except ImageError:
        raise
    except UnidentifiedImageError:
        # PIL's own message names its in-memory file object, which means nothing to a client.
        raise ImageError(
            "it is not an image this server can decode (not a format Pillow recognises)"
        ) from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"it is not an image this server can decode ({exc})") from None


def image_format(data: bytes) -> str:
    """The image's format in lower case (``png``, ``jpeg``), once it decodes within limits."""
    from PIL import Image

    open_image(data)
    with Image.open(io.BytesIO(data)) as probe:
        return (probe.format or "png").lower()


class VisionModel:
    """A loaded model's vision side (see the module header)."""

    def __init__(self, model: Any, processor: Any, model_type: str) -> None:
        self.model = model  # mlx-vlm's model (lazy: only the tower and embeddings are read)
        self.processor = processor
        self.mrope = model_type in MROPE
        tokenizer = processor.tokenizer
        self.placeholder: str = processor.image_token
        opening, closing = _WRAPPED.get(model_type, ("", ""))
        self.template_text = f"{opening}{self.placeholder}{closing}"
        ids = tokenizer.encode(self.placeholder, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the image placeholder {self.placeholder!r} is not one token")
        self.placeholder_id: int = int(ids[0])
        config = model.config
        token = getattr(config, "image_token_id", None)
        if token is None:
            token = getattr(config, "image_token_index", None)
        self.image_token_id: int = int(token if token is not None else self.placeholder_id)
        self._registry = _Registry(REGISTRY_ENTRIES)

    # -- any thread (the processor: NumPy and PIL) ------------------------------------------

    def prepare(self, image: ImageRef) -> Prepared:
        """The processor's arrays and token run for ``image``; ``ImageError`` if refused."""
        key = (hashlib.sha256(image.url.encode()).hexdigest(), image.detail)
        found = self._registry.by_url(key)
        if found is not None:
            return found
        picture = open_image(decode_data_url(image.url))
        prepared = self._prepare(picture, image.detail)
        self._registry.put(key, prepared)
        return prepared

    def _prepare(self, picture: Any, detail: str) -> Prepared:
        processor = self.processor
        options = self._detail_options(detail)
        try:
            found = processor.image_processor(images=[picture], return_tensors="np", **options)
            arrays = {key: np.asarray(value) for key, value in dict(found).items()}
            expansion = self._expansion(arrays)
        except Exception as exc:  # the processor's own refusal (size, format)
            raise ImageError(f"the model's image processor refused it ({exc!r})") from None
        digest = hashlib.sha256()
        digest.update(f"{picture.mode}{picture.size}{sorted(options.items())}".encode())
        digest.update(picture.tobytes())
        handle = int.from_bytes(digest.digest()[:6], "big") + 1
        ids = self.processor.tokenizer.encode(expansion, add_special_tokens=False)
        tokens = tuple(-handle if int(t) == self.image_token_id else int(t) for t in ids)
        if -handle not in tokens:
            raise ImageError("the model's image processor gave this image no image tokens")
        return Prepared(handle, arrays, tokens, self._advance(arrays, tokens.count(-handle)))

    def _advance(self, arrays: Mapping[str, Any], count: int) -> int:
        """How many positions M-RoPE gives an image's ``count`` tokens; the prompt's text
        after the image then stands ``count`` minus that lower than its index."""
        merge = getattr(self.processor.image_processor, "merge_size", None)
        grid = arrays.get("image_grid_thw")
        if not self.mrope or grid is None or not isinstance(merge, int):
            return count
        t, h, w = (int(v) for v in grid[0])
        return max(t, h // merge, w // merge)

    def _expansion(self, arrays: Mapping[str, Any]) -> str:
        """The text that stands for one image in the prompt, as the processor expands its
        placeholder (NumPy only: MLX stays on the generation thread)."""
        processor = self.processor
        merge = getattr(processor.image_processor, "merge_size", None)
        grid = arrays.get("image_grid_thw")
        if grid is not None and isinstance(merge, int):  # Qwen-VL: one token per merged patch
            return str(self.placeholder * (int(grid[0].prod()) // (merge * merge)))
        full = getattr(processor, "full_image_sequence", None)
        if isinstance(full, str):  # Gemma 3
            return full
        return str(processor.replace_image_token(arrays, image_idx=0))

    def _detail_options(self, detail: str) -> dict[str, Any]:
        """Processor options for ``detail``: "low" caps the pixel budget where the processor
        has one (Qwen-VL's ``max_pixels``, which mlx-vlm reads from Qwen3-VL's
        ``size.longest_edge``) at ``LOW_DETAIL_TOKENS`` tokens' worth of pixels; elsewhere the
        processor's size is fixed."""
        if detail != "low":
            return {}
        image_processor = self.processor.image_processor
        budget = getattr(image_processor, "max_pixels", None)
        if isinstance(budget, int):  # mlx-vlm's Qwen-VL processors
            return {"max_pixels": min(budget, low_detail_pixels(image_processor))}
        size = getattr(image_processor, "size", None)
        if isinstance(size, Mapping) and "longest_edge" in size:  # Hugging Face's
            low = min(int(size["longest_edge"]), low_detail_pixels(image_processor))
            return {"size": {**size, "longest_edge": low}}
        return {}

    def arrays_of(self, handle: int) -> Mapping[str, Any] | None:
        found = self._registry.get(handle)
        return None if found is None else found.arrays

    def images_for(self, prompt: Sequence[int]) -> tuple[ImageInput, ...]:
        """The images ``prompt``'s handles stand for, in order of first use; ``ImageError``
        when one is no longer held (rendering the prompt again prepares it again)."""
        images: list[ImageInput] = []
        for handle in dict.fromkeys(handle for _, _, handle in image_runs(prompt)):
            found = self._registry.plain(handle)
            if found is None:
                raise ImageError("an image of this prompt is no longer held; send it again")
            images.append(found)
        return tuple(images)

    def render(
        self,
        chat: Sequence[Mapping[str, Any]],
        render: Callable[[Sequence[Mapping[str, Any]]], list[int]],
    ) -> list[int]:
        """``render(chat)`` with each image part (``images.Content``) written as the template
        writes an image, then each placeholder token replaced by its image's token run."""
        images: list[ImageRef] = []
        written = [self._write_images(message, images) for message in chat]
        if not images:
            return render(chat)
        prepared = [self.prepare(image) for image in images]
        ids = render(written)
        places = [i for i, token in enumerate(ids) if token == self.placeholder_id]
        if len(places) != len(prepared):
            raise ImageError(
                f"the prompt has {len(places)} image placeholders for {len(prepared)} images "
                f"(the text may contain the model's image token {self.placeholder!r})"
            )
        out: list[int] = []
        start = 0
        for place, image in zip(places, prepared, strict=True):
            out.extend(ids[start:place])
            out.extend(image.tokens)
            start = place + 1
        out.extend(ids[start:])
        if self.mrope and out:
            # Its prefill moves every position by this much (vision_prefill): the first id
            # carries it, the prompt cache keeps it beside the entry, and a prompt moved
            # otherwise turns the keys it reuses to its own move (vision_prefill.moved).
            moved = sum(len(p.tokens) - p.advance for p in prepared)
            out[0] = shift_tag(moved, out[0])
        return out

    def _write_images(self, message: Mapping[str, Any], images: list[ImageRef]) -> Any:
        content = message.get("content")
        if not holds_images(content):
            return message
        images.extend(images_of(content))
        return {**message, "content": text_of(content, self.template_text)}


def load_vision(path: str, text_model: Any) -> VisionModel:
    """mlx-vlm's model (lazily: the language-model weights it also holds are never read) and
    processor for ``path``. Call it on the generation thread, with mlx-lm's ``text_model``."""
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import load_model as load_vlm
    from mlx_vlm.utils import load_processor

    model = load_vlm(Path(path), lazy=True)
    processor = load_processor(path, add_detokenizer=False)
    config = json.loads((Path(path) / "config.json").read_text())
    vision = VisionModel(model, processor, str(config.get("model_type", "")))
    text = getattr(text_model, "language_model", text_model)
    if getattr(getattr(text, "model", None), "pipeline_size", 1) > 1:
        # Untested, and mlx-vlm's language model (M-RoPE) cannot pass activations on.
        raise ValueError(
            "a vision model cannot be split by layers (--pipeline); leave out --pipeline to "
            "split it by tensors"
        )
    if vision.mrope:
        # Its language model prefills image spans: the same arrays as mlx-lm's, not a copy.
        _share_split_layers(model.language_model, text_model.language_model)
        weights = tree_flatten(text_model.language_model.parameters())
        model.language_model.load_weights(weights, strict=True)
    return vision


def _share_split_layers(vlm_text: Any, text: Any) -> None:
    """On a rank of a model split by tensors, give mlx-vlm's language model the
    split layers of mlx-lm's (the same modules, so the same share of the weights and the same
    collectives) and its attention's share of the heads. A no-op on an unsplit model."""
    from mlx.nn.layers import distributed

    inner = text.model
    split = (
        distributed.AllToShardedLinear,
        distributed.ShardedToAllLinear,
        distributed.QuantizedAllToShardedLinear,
        distributed.QuantizedShardedToAllLinear,
    )
    for theirs, ours in zip(vlm_text.model.layers, inner.layers, strict=True):
        for name, module in ours.named_modules():
            if not isinstance(module, split):
                continue
            *path, leaf = name.split(".")
            parent = theirs
            for part in path:
                parent = getattr(parent, part)
            setattr(parent, leaf, module)
        for count in ("n_heads", "n_kv_heads"):
            value = getattr(ours.self_attn, count, None)
            if isinstance(value, int) and hasattr(theirs.self_attn, count):
                setattr(theirs.self_attn, count, value)


# A prompt's first id, when M-RoPE moves its positions: ``-(TAG + moved << 24 + first id)``,
# far below any image handle (48 bits).
TAG: Final = 1 << 60


def shift_tag(moved: int, first: int) -> int:
    return -(TAG + (moved << 24) + first)


def moved_of(token: int) -> int:
    """How far a tagged first id (``shift_tag``) says its prompt's positions are moved; 0 for
    any other id."""
    return (-token - TAG) >> 24 if token <= -TAG else 0


def untag(token: int) -> int:
    """The model's id at a tagged position (``shift_tag``); any other id unchanged."""
    return (-token - TAG) & ((1 << 24) - 1) if token <= -TAG else token


def image_runs(prompt: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, handle)`` of each image run in a rendered prompt, in order."""
    prompt = [untag(t) for t in prompt]
    runs: list[tuple[int, int, int]] = []
    start = -1
    for i, token in enumerate(prompt):
        if token < 0 and (start < 0 or prompt[start] != token):
            if start >= 0:
                runs.append((start, i, -prompt[start]))
            start = i
        elif token >= 0 and start >= 0:
            runs.append((start, i, -prompt[start]))
            start = -1
    if start >= 0:
        runs.append((start, len(prompt), -prompt[start]))
    return runs
