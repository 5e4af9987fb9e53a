"""Tools over the API: the command line, the demo, checkpoint verification.
"""
