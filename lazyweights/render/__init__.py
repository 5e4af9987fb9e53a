"""Seeing a plan: text (`explain`) and pictures (`visualize`), from graph nodes and compiled steps.
"""
