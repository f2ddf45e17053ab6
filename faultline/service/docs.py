"""/docs (Swagger UI) and /redoc from assets the service serves itself, so they work on an air-gapped
cluster: the JavaScript and CSS come from the `fastapi-offline` package (MIT), served under /static/."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=assets_dir()), name="static")

    @app.get("/docs", include_in_schema=False)
    async def swagger():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="faultline: API",
                                   oauth2_redirect_url="/docs/oauth2-redirect",
                                   swagger_js_url="/static/swagger-ui-bundle.js",
                                   swagger_css_url="/static/swagger-ui.css", swagger_favicon_url="/static/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title="faultline: API",
                              redoc_js_url="/static/redoc.standalone.js", redoc_favicon_url="/static/favicon.png",
                              with_google_fonts=False)
