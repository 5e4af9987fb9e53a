"""The lazy API: `WeightData`, `Weights`/`load_weights`, `Weight`, `Plan` (the one user of compiler/ and run/).
"""
