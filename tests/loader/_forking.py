"""What the loader tests that fork their workers share."""

import pytest

# Fork keeps these tests fast (no re-import of torch). Python 3.12+ warns about forking a
# process with threads (torch's own), which is harmless for DataLoader workers.
fork_warning = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)
