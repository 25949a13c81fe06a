"""The evaluation harness: readers, metrics, and records x methods x budgets -> rows, tables and plots."""
