"""The online ranker: HTTP (app) apart from ranking (ranking), typed errors mapped to statuses in errors.

Nothing here imports Prefect or reads the environment; settings arrive as a ServingConfig.
"""
