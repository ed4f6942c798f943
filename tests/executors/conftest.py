"""The Ray tests (``cluster/``) are collected only inside the loopback-only network
namespace that ``test_ray_namespace.py`` runs them in (Ray listens on every interface
otherwise)."""

import os

from tests.executors.namespace import INSIDE

collect_ignore = [] if os.environ.get(INSIDE) else ["cluster"]
