package PVE::Notify;

# A STAND-IN for Proxmox's PVE::Notify (pve-cluster), for pvestord's tests:
# records each notify() call as one JSON line in $PVESTORD_TEST_NOTIFY_LOG
# instead of rendering and sending it. Put on PERL5LIB by
# tests/unit/test_notify_sender.py; never installed.

use strict;
use warnings;

use JSON::PP;

sub common_template_data {
    return { hostname => 'standin-node', fqdn => 'standin-node.example' };
}

sub notify {
    my ($severity, $template_name, $template_data, $fields, $config) = @_;
    my $path = $ENV{PVESTORD_TEST_NOTIFY_LOG} or die "PVESTORD_TEST_NOTIFY_LOG not set\n";
    die "stand-in told to fail\n" if $ENV{PVESTORD_TEST_NOTIFY_FAIL};
    open(my $fh, '>>', $path) or die "cannot open $path: $!\n";
    print $fh JSON::PP->new->canonical->encode({
        severity => $severity, template => $template_name,
        data => $template_data, fields => $fields,
    }), "\n";
    close($fh) or die "cannot write $path: $!\n";
    return;
}

1;
