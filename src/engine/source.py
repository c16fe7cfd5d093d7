"""Where the model comes from: a local folder (checked) or a hub id (downloaded).

Invariants:
- Runs in the CLI before the server starts, so a model that cannot be had stops start-up with
  one paragraph naming the model and what to do (``ModelSourceError``), never a traceback.
- A folder is checked for the files mlx-lm needs; the message names the first one missing.
- A hub id is fetched with huggingface-hub's own ``snapshot_download`` (its progress bars on
  the terminal), with mlx-lm's file patterns, then checked like a folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ModelSourceError(Exception):
    """A model that cannot be loaded; ``str`` is the message for the user."""


_FIX = "Pass --model with a local folder holding an mlx-lm model, or a hub id such as mlx-community/Qwen3-0.6B-4bit."


def locate_model(path_or_id: str) -> str:
    """The local folder to load: ``path_or_id`` itself, or the hub id's downloaded snapshot."""
    candidate = Path(path_or_id).expanduser()
    if candidate.exists():
        check_model_folder(candidate, path_or_id)
        return str(candidate.resolve())
    if path_or_id.startswith(("/", ".", "~")) or path_or_id.count("/") > 1:
        raise ModelSourceError(
            f"Cannot load the model '{path_or_id}': there is no such folder. {_FIX}"
        )
    folder = _download(path_or_id)
    check_model_folder(folder, path_or_id)
    return str(folder)


def check_model_folder(folder: Path, name: str) -> None:
    """Raise ``ModelSourceError`` naming the first file mlx-lm needs that ``folder`` lacks."""
    where = f"Cannot load the model '{name}': the folder {folder}"
    if not folder.is_dir():
        raise ModelSourceError(f"{where} is a file, not a model folder. {_FIX}")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelSourceError(
            f"{where} has no config.json, so it is not an mlx-lm model (expected config.json, "
            f"model*.safetensors and tokenizer files). {_FIX}"
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelSourceError(
            f"{where} has a config.json that is not valid JSON ({exc})."
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelSourceError(
            f'{where} has a config.json without a "model_type", so mlx-lm cannot tell its '
            f"architecture. {_FIX}"
        )
    if not any(folder.glob("model*.safetensors")):
        raise ModelSourceError(
            f"{where} has no weights: model.safetensors (or model-*.safetensors shards) is "
            f"missing. mlx-lm reads safetensors only; convert other formats with "
            f"`mlx_lm.convert`. {_FIX}"
        )
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise ModelSourceError(
            f"{where} has no tokenizer: tokenizer.json (or tokenizer.model) is missing. {_FIX}"
        )


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    head = f"Cannot load the model '{repo_id}':"
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=DEFAULT_ALLOW_PATTERNS))
    except HFValidationError:
        raise ModelSourceError(
            f"{head} it is neither an existing folder nor a valid Hugging Face hub id "
            f"(owner/name). {_FIX}"
        ) from None
    except GatedRepoError:
        raise ModelSourceError(
            f"{head} the repository on the Hugging Face hub is gated. Accept its terms on "
            f"huggingface.co and log in (`hf auth login`, or set HF_TOKEN), then start again."
        ) from None
    except RepositoryNotFoundError:
        raise ModelSourceError(
            f"{head} there is no such repository on the Hugging Face hub (or it is private: "
            f"log in with `hf auth login`, or set HF_TOKEN). Check the spelling. {_FIX}"
        ) from None
    except RevisionNotFoundError:
        raise ModelSourceError(f"{head} the hub has no such revision. {_FIX}") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub could not be reached"
        raise ModelSourceError(
            f"{head} it is not in the local Hugging Face cache and {why}. Download it once "
            f"while online (`hf download {repo_id}`), point HF_HOME at a cache that has it, "
            f"or pass --model with a local folder."
        ) from None
    except OSError as exc:
        raise ModelSourceError(
            f"{head} downloading it from the Hugging Face hub failed ({exc}). Check the network "
            f"and the id, or pass --model with a local folder."
        ) from None
