"""The engine: one image (or a batch of pages) through canvas, texture channels, gestalt, query, relevance,
sampler and extraction; :class:`arr_coc.engine.pipeline.ARR` composes the stages. Everything above it
(contexts, allocators, VLM adapters, evaluation, the app, the CLI) goes through :class:`ARR`."""
