"""Images for the vision benchmark: ImageNet-style trees packed into LMDB, read back by a
PyTorch Dataset, and staged to node-local storage at job start.

Modules: ``trees`` (list a split of an ImageNet-1k or TinyImageNet-200 tree),
``lmdb_pack`` (write one LMDB per split), ``lmdb_dataset`` (the reader),
``stage_in`` (copy to node-local storage and remove afterwards), ``sample_data``
(small trees of real JPEGs for tests and the local configuration).
"""
