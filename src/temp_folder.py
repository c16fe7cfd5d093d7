"""The temp folder MLX compiles its kernels in must be a folder: checked before start.

Invariants:
- MLX compiles fused kernels (on the CPU with the system's C++ compiler) into the folder C++'s
  ``std::filesystem::temp_directory_path`` names: the first of ``TEMP_VARIABLES`` that is set,
  even to an empty value, else ``/tmp``. When that is not a folder, every compilation raises
  ``filesystem error: temp_directory_path``: the warm-up fails, and so does the first step of
  every request that needs a new kernel, which ends the generation thread each time. So
  ``serve`` refuses to start instead, naming the variable and its value.
- Pure but for ``is_folder`` (``os.path.isdir`` unless given).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

# The order C++'s temp_directory_path reads them in (libstdc++ and libc++ alike).
TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")
FALLBACK = "/tmp"


def temp_folder_problem(
    environ: Mapping[str, str], is_folder: Callable[[str], bool] = os.path.isdir
) -> str | None:
    """Why MLX could not use the temp folder ``environ`` names, or None when it can."""
    for name in TEMP_VARIABLES:
        if name in environ:
            value = environ[name]
            if is_folder(value):
                return None
            return (
                f"{name}={value!r} is not a folder. MLX compiles its kernels in the temp folder "
                f"that the first of {', '.join(TEMP_VARIABLES)} set names; point {name} at a "
                f"folder or unset it."
            )
    if is_folder(FALLBACK):
        return None
    return (
        f"{FALLBACK} is not a folder and none of {', '.join(TEMP_VARIABLES)} is set. MLX "
        "compiles its kernels in the temp folder; set TMPDIR to a folder."
    )
