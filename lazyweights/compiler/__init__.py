"""The plan compiler: a whole state dict of graph nodes -> fused, ordered, budgeted steps. Pure: reads no bytes.
"""
