"""The Ray tests (``cluster/``) are collected only inside the loopback-only network
namespace that ``test_ray_namespace.py`` runs them in (Ray listens on every interface
otherwise)."""

import os

INSIDE = "CONCURRENT_LOADER_LOOPBACK_NAMESPACE"

collect_ignore = [] if os.environ.get(INSIDE) else ["cluster"]
