"""An image prompt's admission on the generation thread.

mlx-lm's ``BatchGenerator`` prefills from token ids only, and an image's positions have no
token embedding. So at admission the thread runs the vision tower once (mlx-vlm's
``get_input_embeddings``), prefills the language model from those embeddings up to the end of
the last image, and inserts the sequence with that cache and the rest of its prompt (text),
exactly as a prompt-cache hit is inserted. From there it is a sequence like any other: it
decodes in the same batch and a cancel removes it at the next step.

Invariants:
- Called only on the generation thread (MLX), with the images the sequence's ``Admit`` carries
  (``ImageInput``): nothing is read from an object another thread holds.
- What the prompt cache already holds is not computed again: prefill starts at the reused
  length when it falls between images (a reuse that ends inside an image is dropped,
  ``prefill_start``), also on M-RoPE families, whose reused keys were first turned to this
  prompt's move (``moved``). An image wholly before that start needs no pixels, and its
  ``Admit`` carries none (``lighter``); the rest carry theirs.
- A reused cache is prefilled into only through arrays of its own (``_detached``): the stored
  entry it came from never changes.
- The model never sees a negative id: the prompt handed on has the model's image token there.
- The prompt cache keys what the sequence stores by the prompt *with* its image handles
  (``keyed``), so only the same image can ever be served from it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .inbound import Admit, ImageInput, SequenceSpec
from .prompt_cache import Reuse
from .vision import VisionModel, image_arrays, image_runs, moved_of, untag

if TYPE_CHECKING:
    from .loader import LoadedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VisionStart:
    """Where an image prompt enters the batch: its model-facing prompt, the length its cache
    holds and that cache, and the tokens the prompt cache had served."""

    prompt: tuple[int, ...]
    start: int
    cache: list[Any] | None
    reused: int


@dataclass(frozen=True, slots=True)
class CacheMatch:
    """An ``Admit`` met with the prompt cache (``match_cache``), before it is recorded or
    broadcast: the message as it goes on, what the cache served (``reuse``), that cache turned
    to the prompt's move (None: nothing reused) and how many tokens it holds."""

    message: Admit
    reuse: Reuse
    cache: list[Any] | None
    reused: int


def match_cache(message: Admit, reuse: Reuse, model: Any) -> CacheMatch:
    """``message`` with what the prompt cache serves it (``reuse``): its reused keys turned to
    its prompt's move (``moved``), and its images without the pixels of those wholly inside
    the reused prefix (``lighter``). Every rank and every replay meets the same message with
    the same cache, so what it leaves out none of them needs."""
    spec = message.spec
    try:
        cache = moved(model, reuse, spec.prompt)
    except Exception:
        log.exception("prompt cache: a reused prefix could not be turned; prefilling it")
        cache = None
    reused = reuse.tokens if cache is not None else 0
    images = lighter(spec.images, spec.prompt, reused) if spec.images else spec.images
    if images is not spec.images:
        message = replace(message, spec=replace(spec, images=images))
    return CacheMatch(message, reuse, cache, reused)


def admission_start(
    loaded: LoadedModel, spec: SequenceSpec, found: CacheMatch, step: int
) -> VisionStart:
    """Where a sequence enters the batch: after what the prompt cache holds, or, for an image
    prompt, after its images, prefilled here from the vision tower's embeddings; with
    ``--kv-bits``, with its plain KV layers quantized (``kv_cache.quantize_layers``)."""
    vision = loaded.vision
    if vision is None or min(spec.prompt, default=0) >= 0:
        start = VisionStart(spec.prompt, found.reused, found.cache, found.reused)
    else:
        start = vision_prefill(
            vision, loaded.model, spec.prompt, spec.images, found.cache, found.reused, step
        )
    if loaded.kv_quant is None:
        return start
    from .kv_cache import quantize_layers  # every sequence's layers alike: merge needs it

    return replace(start, cache=quantize_layers(start.cache, loaded.model, loaded.kv_quant))


def model_prompt(vision: VisionModel, prompt: Sequence[int]) -> tuple[int, ...]:
    token = vision.image_token_id
    return tuple(token if t < 0 else t for t in (untag(t) for t in prompt))


def keyed(tokens: Sequence[int], prompt: Sequence[int]) -> tuple[int, ...]:
    """``tokens`` (what the generator holds: the model-facing prompt and what followed) with the
    image handles of ``prompt`` back in place: the key the prompt cache stores it under."""
    out = list(tokens)
    for i in range(min(len(out), len(prompt))):
        if prompt[i] < 0:
            out[i] = prompt[i]
    return tuple(out)


class KeyedGenerator:
    """A ``BatchGenerator`` as ``PromptCache.checkpoint`` reads one sequence from it: the
    tokens it holds, keyed by ``prompt``'s image handles."""

    __slots__ = ("_generator", "_prompt")

    def __init__(self, generator: Any, prompt: Sequence[int]) -> None:
        self._generator = generator
        self._prompt = prompt

    def extract_cache(self, uids: list[int]) -> dict[int, tuple[Any, tuple[int, ...]]]:
        found = self._generator.extract_cache(uids)
        return {uid: (cache, keyed(tokens, self._prompt)) for uid, (cache, tokens) in found.items()}


def prefill_start(runs: Sequence[tuple[int, int, int]], reused: int) -> int:
    """Where an image prompt's prefill starts when its cache holds ``reused`` tokens: there,
    unless that ends inside an image (``runs``, ``vision.image_runs``), then at 0."""
    return 0 if any(start < reused < stop for start, stop, _ in runs) else reused


def lighter(
    images: tuple[ImageInput, ...], prompt: Sequence[int], reused: int
) -> tuple[ImageInput, ...]:
    """``images`` as the ``Admit`` of ``prompt`` needs them when the prompt cache serves its
    first ``reused`` tokens: an image with no run at or after where the prefill starts is
    never shown to the vision tower, so it goes without its pixels (``without_pixels``)."""
    runs = image_runs(prompt)
    start = prefill_start(runs, reused)
    needed = {handle for first, _, handle in runs if first >= start}
    out = tuple(image if image.handle in needed else image.without_pixels() for image in images)
    return images if all(a is b for a, b in zip(out, images, strict=True)) else out


def _images(runs: list[tuple[int, int, int]], images: Mapping[int, ImageInput]) -> list[ImageInput]:
    """The image of each copy in ``runs`` (a run of one handle may hold the same image more
    than once, back to back)."""
    out: list[ImageInput] = []
    for start, end, handle in runs:
        image = images.get(handle)
        if image is None:
            raise RuntimeError(f"the sequence's Admit carries no image for handle {handle}")
        out.extend([image] * max(1, (end - start) // image.tokens))
    return out


def _stacked(images: list[ImageInput]) -> dict[str, Any]:
    import mlx.core as mx
    import numpy as np

    for image in images:
        if not image.has_pixels:  # ``lighter`` judged by another cache than this one
            raise RuntimeError(
                f"the sequence's Admit left out the pixels of image {image.handle}, which the "
                "prompt cache does not hold"
            )

    parts = [image_arrays(image) for image in images]
    return {key: mx.array(np.concatenate([p[key] for p in parts], axis=0)) for key in parts[0]}


def vision_prefill(
    vision: VisionModel,
    model: Any,
    prompt: Sequence[int],
    images: Sequence[ImageInput],
    cache: list[Any] | None,
    reused: int,
    step: int,
) -> VisionStart:
    """Prefill ``prompt``'s image span (after the ``reused`` tokens ``cache`` holds) from
    ``images``, the arrays of each handle in it."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    real = model_prompt(vision, prompt)
    runs = image_runs(prompt)
    end = runs[-1][1] if runs else 0
    if reused >= end:
        return VisionStart(real, reused, cache, reused)
    if prefill_start(runs, reused) != reused:
        cache, reused = None, 0  # a reuse that ends inside an image
    todo = [run for run in runs if run[0] >= reused]
    by_handle = {image.handle: image for image in images}
    arrays = _stacked(_images(todo, by_handle))
    ids = mx.array(real[reused:end])[None]
    pixels = arrays.pop("pixel_values")
    features = vision.model.get_input_embeddings(
        input_ids=ids, pixel_values=pixels, mask=mx.ones(ids.shape), **arrays
    )
    deepstack = _deepstack(vision, features)
    for unsupported in ("per_layer_inputs", "cross_attention_states"):
        if getattr(features, unsupported, None) is not None:
            raise RuntimeError(f"this model's vision input needs {unsupported} (unsupported)")
    embeddings = getattr(features, "inputs_embeds", features)
    cache = make_prompt_cache(model) if cache is None else _detached(cache)
    positions = None
    if vision.mrope:  # numbered from the prompt's start, so with every image's grid
        grids = np.concatenate(
            [image_arrays(image)["image_grid_thw"] for image in _images(runs, by_handle)]
        )
        whole = mx.array(real[:end])[None]
        positions = _mrope_positions(vision, whole, mx.array(grids))[:, :, reused:end]
    length = end - reused
    for a in range(0, length, step):
        b = min(a + step, length)
        if positions is None:
            model(ids[:, a:b], cache=cache, input_embeddings=embeddings[:, a:b])
        else:
            vision.model.language_model.model(
                ids[:, a:b],
                inputs_embeds=embeddings[:, a:b],
                cache=cache,
                position_ids=positions[:, :, a:b],
                **({} if deepstack is None else deepstack.chunk(a, b)),
            )
        mx.eval([layer.state for layer in cache])
    return VisionStart(real, end, cache, reused)


@dataclass(frozen=True, slots=True)
class _Deepstack:
    """Qwen3-VL's deepstack input for the prefilled span: which of its positions are image
    tokens, and per early decoder layer the tower's features of those tokens only (one row per
    image token, in order), which mlx-vlm's language model adds to that layer's output."""

    mask: Any  # (1, span) bool
    embeds: list[Any]  # per layer: (image tokens in the span, hidden)
    before: list[int]  # image tokens before each position of the span, and in the whole span

    def chunk(self, a: int, b: int) -> dict[str, Any]:
        """The arguments for positions ``a:b``; none when the chunk holds no image token."""
        lo, hi = self.before[a], self.before[b]
        if lo == hi:
            return {}
        return {
            "visual_pos_masks": self.mask[:, a:b],
            "deepstack_visual_embeds": [layer[lo:hi] for layer in self.embeds],
        }


def _deepstack(vision: VisionModel, features: Any) -> _Deepstack | None:
    """``features``' deepstack input, when the model takes one (``RuntimeError`` on a model
    whose prefill cannot pass it on: only mlx-vlm's Qwen-VL language model takes it)."""
    import itertools

    embeds = getattr(features, "deepstack_visual_embeds", None)
    if embeds is None:
        return None
    if not vision.mrope:
        raise RuntimeError("this model's vision input needs deepstack_visual_embeds (unsupported)")
    mask = features.visual_pos_masks
    flags = [bool(v) for v in mask[0].tolist()]
    before = [0, *itertools.accumulate(int(v) for v in flags)]
    return _Deepstack(mask, list(embeds), before)


def _mrope_positions(vision: VisionModel, ids: Any, grids: Any) -> Any:
    """Qwen-VL's multimodal positions of ``ids`` (the prompt up to its last image), moved so
    that the text after the last image sits at its own index.

    mlx-lm's text model numbers every later token by its index in the cache; M-RoPE numbers it
    by its index plus the prompt's ``rope_deltas`` (an image of h x w merged patches takes h*w
    tokens but only max(h, w) positions). Rotary attention sees only differences of positions,
    so moving every prefilled position by minus that delta gives every later token exactly the
    differences M-RoPE gives it."""
    import mlx.core as mx

    positions, deltas = vision.model.language_model.get_rope_index(
        ids, grids, None, mx.ones(ids.shape)
    )
    return positions - mx.reshape(deltas, (1, -1, 1))


def _detached(cache: list[Any]) -> list[Any]:
    """``cache`` with each plain KV layer holding its own arrays: a fetched layer shares its
    arrays with the stored entry, and a prefill that fits in their spare room would write
    into them in place (``KVCache.update_and_fetch``), changing the entry under its key."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    out: list[Any] = []
    for layer in cache:
        quantized = isinstance(layer, QuantizedKVCache)  # --kv-bits: triples of arrays
        if (type(layer) is KVCache or quantized) and layer.keys is not None:
            fresh = copy.copy(layer)
            count = int(layer.offset)
            cut = (Ellipsis, slice(None, count), slice(None))
            if quantized:
                fresh.keys = tuple(part[cut] for part in layer.keys)
                fresh.values = tuple(part[cut] for part in layer.values)
            else:
                fresh.keys, fresh.values = layer.keys[cut], layer.values[cut]
            fresh.offset = count
            layer = fresh
        out.append(layer)
    return out


def moved(model: Any, reuse: Reuse, prompt: Sequence[int]) -> list[Any] | None:
    """``reuse``'s cache with its keys' positions turned from its entry's move to ``prompt``'s
    (``vision.shift_tag``); None when they differ and cannot be turned (then nothing is reused).

    Rotary attention rotates a key at position p by p times each frequency, so a key stored
    at p + m becomes the key at p + m' by one more rotation of m' - m, for every key alike: the
    prefix an M-RoPE image prompt shares with a text prompt, or with one of other images, is
    reused instead of prefilled again (Codex's turn that adds a ``view_image`` output reuses the
    turn before it). Only plain KV caches under a plain rotary embedding are turned."""
    import mlx.core as mx
    from mlx.nn import RoPE
    from mlx_lm.models.cache import KVCache

    cache = reuse.cache
    shift = (moved_of(prompt[0]) if prompt else 0) - reuse.moved
    if cache is None or shift == 0:
        return cache
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) != len(cache):
        return None
    turned: list[Any] = []
    for layer, held in zip(layers, cache, strict=True):
        rope: Any = getattr(getattr(layer, "self_attn", None), "rope", None)
        if type(rope) is not RoPE or type(held) is not KVCache or held.keys is None:
            return None
        count = int(held.offset)
        keys = held.keys[..., :count, :]
        batch, heads, _, width = keys.shape
        # One position per row: every key rotated by ``shift`` alone.
        keys = rope(keys.reshape(batch, heads * count, 1, width), offset=shift)
        fresh = KVCache()
        fresh.keys = keys.reshape(batch, heads, count, width)
        fresh.values, fresh.offset = held.values[..., :count, :], count
        turned.append(fresh)
    mx.eval([layer.keys for layer in turned])
    return turned
