"""The lazy graph: immutable nodes (`node.py`) and the op table with shape/dtype rules (`ops.py`)."""
from .node import Const, IndexArray, Node, toposort

__all__ = ["Const", "IndexArray", "Node", "toposort"]
