package PvestordTest::InstalledPlugin;

# TEST STAND-IN for a Proxmox node's /usr/share/perl5. Load first, in a private
# mount namespace (the test runs perl under 'unshare --mount'): the installed
# package's usr/share/perl5 ($PVESTORD_TEST_INSTALLED_PERL5) is laid over the
# system's with an overlay mount, so upstream's own loader finds the plugin in
# /usr/share/perl5/PVE/Storage/Custom, where Proxmox looks for it.

use strict;
use warnings;

BEGIN {
    my $installed = $ENV{PVESTORD_TEST_INSTALLED_PERL5}
        // die "PVESTORD_TEST_INSTALLED_PERL5 is not set\n";
    system('mount', '-t', 'overlay', 'overlay', '-o',
        "lowerdir=$installed:/usr/share/perl5", '/usr/share/perl5') == 0
        or die "overlay mount of $installed on /usr/share/perl5 failed\n";
}

1;
