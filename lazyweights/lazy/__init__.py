"""The lazy tensor and the plan: `WeightData`, `Weights`/`load_weights`, `Weight`, `Plan` and saving a plan (the one
user of compiler/ and run/). Named `api/` until 2026-11-28 (issue 38: the name said nothing of what it holds); users
import these names from `lazyweights` itself.
"""
