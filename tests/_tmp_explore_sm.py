from __future__ import annotations
import os
from hypothesis import HealthCheck, settings
from tests.test_background_state_machine import BackgroundMachine

class Explore(BackgroundMachine):
    pass

Explore.TestCase.settings = settings(
    max_examples=int(os.environ.get("N", "150")), stateful_step_count=int(os.environ.get("STEPS", "20")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow], database=None,
)
TestExplore = Explore.TestCase
