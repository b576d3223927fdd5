// Anchors the tests' shared precompiled header.
