"""Health as kube-proxy's pkg/proxy/healthcheck serves it: the proxier's
/healthz and /livez with /metrics (`proxier_health`), the healthCheckNodePort
servers of services with externalTrafficPolicy Local (`service_health`), and
the small HTTP server both run on (`httpserver`)."""
