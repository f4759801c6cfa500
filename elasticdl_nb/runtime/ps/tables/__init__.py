"""Embedding tables that hold only the rows they have seen (issue 17): `hash_index.py`
says where each id's row is, `row_store.py` holds the rows (vector and optimizer slots,
id, last update). Admission, eviction and their checkpoints come next (the plan is in
issue 16's closing note)."""
