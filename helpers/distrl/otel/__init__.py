"""OpenTelemetry for RL (notebooks 02 and 05): the semantic conventions and golden signals
(conventions), the local OTLP collector (collector) and the Cloud Monitoring API it answers
(monitoring), and the plots, dashboards and alerts read from either (explore, dashboard)."""
