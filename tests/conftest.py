"""Suite-wide: the fastree install state each test leaves behind.

The suite also runs with fastree installed into JAX for the whole session (``.ci/run``:
``python -m fastree.run -m pytest``). Tests that install or uninstall fastree themselves may end in
either state; after every test the session's state is put back, so one test's ``uninstall()``
cannot turn the rest of an installed session into plain JAX (nor a forgotten ``install()`` the
rest of a plain one).
"""

import fastree
import pytest

SESSION_INSTALLED = fastree.is_installed()


def pytest_report_header(config):
    routed = len(fastree.installed_functions())
    return f"fastree installed into JAX: {'yes, ' + str(routed) + ' functions' if routed else 'no'}"


@pytest.fixture(autouse=True)
def _aux_checks_as_the_module_asks(request):
    """A module that tests the aux_data checks says so with ``AUX_CHECKS = "warn"``: they run
    in plain and installed sessions alike (installed, "auto" turns them off, as JAX has none).
    Every other test runs with the session's own setting."""
    wanted = getattr(request.module, "AUX_CHECKS", None)
    if wanted is None:
        yield
        return
    before = fastree.config.aux_checks
    fastree.config.aux_checks = wanted
    try:
        yield
    finally:
        fastree.config.aux_checks = before


@pytest.fixture(autouse=True)
def _restore_session_install_state():
    yield
    if fastree.is_installed() != SESSION_INSTALLED:
        if SESSION_INSTALLED:
            fastree.install()
        else:
            fastree.uninstall()
