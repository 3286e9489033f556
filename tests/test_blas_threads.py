"""OLU_BLAS_THREADS (config.py ``blas_threads``): the service sets its BLAS libraries' thread count once at start-up,
1 by default (OpenBLAS's idle workers spin after each threaded call or thread-count change: ~180 ms of CPU per
exact_ridge forget at D = 1 025 on a 2-core machine, issue 39), 0 leaving the library's own count; the deterministic
solves' pin restores the process's count after each block."""
from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

from app.config import Settings
from app.main import create_app
from app.unlearning.maths.blas import one_blas_thread


def _counts() -> list[int]:
    import scipy.linalg  # noqa: F401 - scipy's own OpenBLAS is loaded too

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def _app(tmp_path, name: str, **over):
    data = tmp_path / name
    data.mkdir()
    return create_app(Settings(data_dir=data, log_level="WARNING", **over))


def test_the_service_runs_blas_on_one_thread_by_default(tmp_path):
    with threadpool_limits(limits=2, user_api="blas"):  # whatever the process had before
        app = _app(tmp_path, "default")
        assert set(_counts()) == {1}
        with one_blas_thread():
            pass
        assert set(_counts()) == {1}  # the pin restores the process's count
        app.state.ctx.db.dispose()


def test_zero_leaves_the_librarys_count(tmp_path):
    with threadpool_limits(limits=2, user_api="blas"):
        before = _counts()
        app = _app(tmp_path, "zero", blas_threads=0)
        assert _counts() == before
        app.state.ctx.db.dispose()
