"""Tar shards in WebDataset's convention: the format (:mod:`.tar`), its index (:mod:`.index`),
the source (:mod:`.source`), the dataset (:mod:`.dataset`) and the packer (:mod:`.pack`).

The datasets floor: it may import every floor below and :mod:`concurrent_loader.dataset`;
nothing below imports it (``tests/test_layers.py``). Importing the package imports none of
its modules.
"""
