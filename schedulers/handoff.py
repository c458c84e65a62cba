"""A handoff: what one stage hands the next, as an attrs class that crosses processes as cheaply as a dict.

A model family declares one class per edge of its graph (its ``handoffs`` module), each with one
docstring saying who builds it, who reads it, its shapes and who owns its tensors.  :func:`handoff`
makes such a class pickle as a constructor call with its fields in order, the form the runtime's own
contract classes use: attrs' generic pickling (a state dict, set field by field) costs more per message
than a dict of the same fields, and chunks cross once per token.

Tensors inside a handoff are found by the runtime's packer wherever they sit, so they cross through
shared memory exactly as they would inside a dict.

Ownership, for every handoff: it is built once and never changed (frozen); the consumer reads its
tensors and does not write into them.  Between processes the runtime copies tensors through shared
memory and the consumer gets zero-copy views that stay valid while its stage holds the request (the
runtime releases them when the request leaves the stage); in one process the object itself is handed
on.  A consumer that keeps a tensor longer than the request copies it.  Classes that hold tensors
compare by identity; the others (knobs, ids, counts) by value.
"""

from __future__ import annotations

import operator
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


def handoff(cls: type[T]) -> type[T]:
    """Give the attrs class ``cls`` a ``__reduce__`` that rebuilds it by calling ``cls(*fields)``.

    Every field must be an ``__init__`` argument, positional, under its own name (no ``init=False``,
    ``kw_only`` or alias), which is checked here."""
    fields = attrs.fields(cls)  # type: ignore[arg-type]
    for field in fields:
        if not field.init or field.kw_only or field.alias != field.name:
            raise TypeError(f"handoff {cls.__qualname__}: field {field.name!r} is not a plain positional argument")
    names = [field.name for field in fields]
    if len(names) == 1:
        name = names[0]

        def reduce_one(self: Any) -> tuple[Any, tuple[Any, ...]]:
            return cls, (getattr(self, name),)

        cls.__reduce__ = reduce_one  # type: ignore[assignment,method-assign]
    else:
        values = operator.attrgetter(*names)

        def reduce_many(self: Any) -> tuple[Any, tuple[Any, ...]]:
            return cls, values(self)

        cls.__reduce__ = reduce_many  # type: ignore[assignment,method-assign]
    return cls
