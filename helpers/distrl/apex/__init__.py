"""Ape-X on Ray (notebook 01): the driver (driver.ApeX), the Ray actors it creates (workers),
how it rides out lost nodes and SIGTERM (faults), what each process reports (process_telemetry)
and the `distrl train` command (train)."""
