"""Tar shards in WebDataset's convention: the format (:mod:`.tar`), its index (:mod:`.index`),
the source (:mod:`.source`), the dataset (:mod:`.dataset`) and the packer (:mod:`.pack`).
Importing the package imports none of its modules (its floor: ``tests/test_layers.py``).
"""
