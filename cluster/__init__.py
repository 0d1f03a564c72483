"""Running several replicas: a throwaway PostgreSQL, Envoy in front, failover runs."""
