"""`mmaccel serve`: the pipelines behind an OpenAI-compatible HTTP API (`app`), requests of many clients decoded
together by one worker per model (`batching`), with Prometheus metrics (`metrics`)."""
