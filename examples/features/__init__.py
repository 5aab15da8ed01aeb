"""The feature-build example's stage code (examples/oom_escalation.pipe), stdlib only."""
