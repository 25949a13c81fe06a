"""Training: per-image feature cache, proxy and VLM objectives, the loop (`arr-coc train`). Never imports eval."""
