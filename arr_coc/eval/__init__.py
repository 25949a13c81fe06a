"""The evaluation harness: readers, metrics, and records x methods x token counts -> rows, tables and plots."""
