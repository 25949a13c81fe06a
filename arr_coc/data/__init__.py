"""Question-answer records with answer boxes (FUNSD, SROIE, COCO, JSONL) and box geometry.

Training and evaluation both read records; neither imports the other, so the records live here, below both.
"""
