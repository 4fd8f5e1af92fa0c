"""C++ unit tests (compiled with g++ and run by pytest). See README.md."""
