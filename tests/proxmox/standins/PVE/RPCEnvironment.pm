package PVE::RPCEnvironment;

# TEST STAND-IN for pve-access-control's PVE::RPCEnvironment (which pulls in
# TFA, LDAP and PAM): pve-common's real PVE::RESTEnvironment is all the storage
# code uses (get(), is_worker(), fork_worker()).

use strict;
use warnings;

use base qw(PVE::RESTEnvironment);

# The singleton, as the real module offers it: PVE::Storage::vdisk_free calls
# PVE::RPCEnvironment::get() as a function, which inheritance does not reach.
sub get {
    return PVE::RESTEnvironment::get();
}

1;
