"""fsspec's own conformance suite against ``ringfs://``: every class of
``fsspec.tests.abstract`` the installed fsspec provides (copy, get, put, open, pipe...),
run as s3fs, gcsfs and adlfs run it, on a fresh directory of the session's cluster.

Where ringfs deliberately differs from the local file system, the package documentation
(``ringfs.fsspec``) says so; the suite itself runs unchanged.
"""

import posixpath

import fsspec.tests.abstract as abstract
import pytest


class RingfsFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, cluster):
        from ringfs.fsspec import RingFileSystem

        return RingFileSystem()

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, root):
        return root

    @pytest.fixture
    def supports_empty_directories(self):
        return True


SUITES = sorted(name for name in dir(abstract) if name.startswith("Abstract") and name.endswith("Tests"))

# One test class per suite, named so that pytest collects it: TestRingfsCopy, TestRingfsGet, ...
for _name in SUITES:
    _suite = getattr(abstract, _name)
    _class_name = "TestRingfs" + _name[len("Abstract") : -len("Tests")]
    globals()[_class_name] = type(_class_name, (RingfsFixtures, _suite), {})


def test_every_suite_of_the_installed_fsspec_runs():
    """The suites found are run (a newer fsspec adds classes; they run too)."""
    assert {"AbstractCopyTests", "AbstractGetTests", "AbstractPutTests"} <= set(SUITES), SUITES
    for name in SUITES:
        assert "TestRingfs" + name[len("Abstract") : -len("Tests")] in globals()
