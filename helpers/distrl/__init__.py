"""distrl: distributed Ape-X DQN on Ray, instrumented with OpenTelemetry, from laptop to GKE."""

__version__ = "0.1.0"
