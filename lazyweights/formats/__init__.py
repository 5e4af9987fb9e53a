"""Checkpoint formats: readers that validate files into tensor records, writers over one atomic-file helper.
"""
