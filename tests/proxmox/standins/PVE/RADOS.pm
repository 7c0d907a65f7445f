package PVE::RADOS;

# TEST STAND-IN: only so that PVE::Storage's Ceph plugins load; never called.

use strict;
use warnings;

sub new {
    die "PVE::RADOS stand-in: Ceph is not available in tests\n";
}

1;
