# common/data/: gzip-compressed shards (Fashion-MNIST IDX files) are
# decompressed with zlib.
LDLIBS_EXTRA += -lz
