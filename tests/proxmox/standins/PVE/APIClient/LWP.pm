package PVE::APIClient::LWP;

# TEST STAND-IN: only so that PVE::Storage's ESXi/PBS plugins load; never called.

use strict;
use warnings;

sub new {
    die "PVE::APIClient::LWP stand-in: no API client in tests\n";
}

1;
