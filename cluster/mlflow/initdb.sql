-- Run once by the postgres image on an empty data folder: the second database, for MLflow's
-- users and permissions (basic-auth app). The first (POSTGRES_DB=mlflow) holds the runs.
CREATE DATABASE mlflow_auth;
