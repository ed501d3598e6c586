"""Everything the tests share and none of them is: the harness, job apps, fake servers, fixtures and data."""
