"""faultline: diagnose failed distributed AI workloads from their logs, scheduler state and metrics."""

__version__ = "0.1.0"
