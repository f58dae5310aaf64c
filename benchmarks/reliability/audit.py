"""pip-audit over an installed environment, where PyPI serves only each project's latest-release JSON.

    python -m benchmarks.reliability audit --path .venv/lib/python3.11/site-packages --out docs/reliability/DATE

Where a machine reaches PyPI only for ``/pypi/<name>/json`` (no advisory database), pip-audit
skips every dependency. That JSON's ``vulnerabilities`` list answers for the latest release, so
this runs pip-audit itself on it for each installed version that is the latest, and reports every
other dependency as skipped (the latest version in the reason). Nothing here decides what is vulnerable.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packaging.version import Version
from pip_audit._audit import AuditOptions, Auditor
from pip_audit._dependency_source import PipSource
from pip_audit._format import JsonFormat
from pip_audit._service import PyPIService
from pip_audit._service.interface import Dependency, ResolvedDependency, SkippedDependency, VulnerabilityResult

__all__ = ("LatestReleaseService", "main")


class _Answer:
    """A session whose every ``get`` returns one response already fetched."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._response


class LatestReleaseService(PyPIService):
    """pip-audit's PyPI service, answering from the project JSON when it describes the installed version."""

    def query(self, spec: Dependency) -> tuple[Dependency, list[VulnerabilityResult]]:
        if spec.is_skipped():
            return spec, []
        assert isinstance(spec, ResolvedDependency)
        response = self.session.get(url=f"https://pypi.org/pypi/{spec.canonical_name}/json", timeout=self.timeout)
        if response.status_code == 404:
            return SkippedDependency(name=spec.name, skip_reason="not a project on PyPI"), []
        response.raise_for_status()
        latest = Version(response.json()["info"]["version"])
        if spec.version != latest:
            reason = (
                f"installed {spec.version} is not the latest release ({latest}); PyPI's JSON for "
                f"{spec.version} is not reachable from this machine"
            )
            return SkippedDependency(name=spec.name, skip_reason=reason), []
        # pip-audit's own parsing of the answer (withdrawn entries, fix versions, aliases).
        session, self.session = self.session, _Answer(response)
        try:
            return super().query(spec)
        finally:
            self.session = session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--path", required=True, help="site-packages folder of the environment to audit")
    parser.add_argument("--out", required=True, help="folder for pip-audit-latest.json")
    args = parser.parse_args(argv)
    auditor = Auditor(LatestReleaseService(timeout=30), options=AuditOptions(dry_run=False))
    result = dict(auditor.audit(PipSource(paths=[Path(args.path)])))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = json.loads(JsonFormat(output_desc=True, output_aliases=True).format(result, []))
    (out / "pip-audit-latest.json").write_text(json.dumps(doc, indent=1) + "\n")
    audited = [d for d in doc["dependencies"] if "skip_reason" not in d]
    found = [d for d in audited if d["vulns"]]
    print(
        f"{len(doc['dependencies'])} distributions: {len(audited)} audited (installed = latest release), "
        f"{len(doc['dependencies']) - len(audited)} skipped; {sum(len(d['vulns']) for d in found)} findings in "
        f"{len(found)} packages"
    )
    for dep in found:
        for vuln in dep["vulns"]:
            print(
                f"  {dep['name']} {dep['version']}: {vuln['id']} {vuln.get('aliases', [])} fixed in {vuln['fix_versions']}"
            )
    return 0
