//! Black-box tests of the memcg-trace binary live in tests/.
