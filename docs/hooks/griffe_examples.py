"""A griffe extension for the API reference: lazyweights' docstrings title their doctests `Example:` (as
Python's own docs do), which Google-style parsing reads as a plain admonition; renamed `Examples:` here, at
load time, they render as code. The package's docstrings are not changed.

    >>> import re
    >>> re.sub(_TITLE, r"\\1Examples:", "Text.\\n\\n    Example:\\n        >>> 1\\n")
    'Text.\\n\\n    Examples:\\n        >>> 1\\n'
"""
from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Rename each docstring's `Example:` section to `Examples:` once the object is loaded."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """griffe's hook, called for every module, class, function and attribute it loads."""
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
