#include <criterion/criterion.h>
Test(io, placeholder) {}
