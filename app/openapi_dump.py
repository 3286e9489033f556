"""Write the OpenAPI document of the app: ``python -m app.openapi_dump [path]`` (default openapi/openapi.json)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def render() -> str:
    from .config import Settings
    from .main import create_app

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(Settings(data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/openapi.db"))
        doc = app.openapi()
        app.state.ctx.db.dispose()
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
