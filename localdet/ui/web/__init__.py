"""The dashboard: `localdet web` (or `localdet daemon --web`) serves it on 127.0.0.1.

- `app.py`: the Starlette application (pages, JSON API, the guards: Host, token, origin).
- `manage.py`: archive, delete, labels, description, notes and the model registry's pages,
  over the operations `localdet` and `det` call.
- `figures.py`: Plotly figures from the recorded metrics.
- `server.py`: running it with uvicorn, the printed address and the token.
- `static/`: one page and its script; plotly.js is served from the plotly package.
"""
