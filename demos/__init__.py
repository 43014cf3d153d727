"""The mmaccel web app: Gradio tabs (image, speech, text, video) over the pipelines. `python -m demos` or
`mmaccel demo` starts it; `demos.app.build_app()` builds it for tests and embedding."""
