"""The chart's default EndpointPickerConfigs are epp's own files, byte for byte.

Helm can read only files inside the chart, so `deploy/helm/epp/files/` holds copies of the
package's defaults. The rendering tests in test_chart.py compare them parsed; this one also
catches a comment that tells the two defaults apart differently in one copy.
"""

from __future__ import annotations

import pytest

from epp.scheduling import config
from tests.deploy.chart import CHART


@pytest.mark.parametrize(
    ("name", "precise"), [("default-config.yaml", False), ("default-precise-config.yaml", True)]
)
def test_the_charts_default_config_is_a_copy_of_the_packages(name: str, precise: bool) -> None:
    copy = (CHART / "files" / name).read_text(encoding="utf-8")
    assert copy == config.default_config_text(precise=precise), (
        f"deploy/helm/epp/files/{name} differs from epp/scheduling/{name}: copy the package's file"
    )
