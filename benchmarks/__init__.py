"""End-to-end benchmarks: how close to local disk a remote dataset trains, and against what.

Run ``python -m benchmarks --help`` from the repository root. The harness generates an
ImageNet-like JPEG dataset, serves it from a local S3-compatible server behind a latency
proxy, and measures every loader configuration in a fresh, CPU-pinned subprocess.
"""
