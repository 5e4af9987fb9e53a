"""Running compiled steps: one driver (`driver.run`), the CPU block kernels, the reference executor,
the distributed and GPU executors, and the sinks results go to (memory, files, hashes).
"""
