package PvestordTest::LvmDeclaresThinOptions;

# TEST STAND-IN: Proxmox's real LVM plugin as it would be if upstream thin LVM
# gave it options of its own named as pvestord's were before their prefix:
# LVMPlugin::properties() also declares 'chunksize' and 'chunk-percentage',
# and LVMPlugin::options() uses them. Loaded before PvestordTest::StandIns, so
# that PVE::Storage registers and initializes its plugins with it in place.

use strict;
use warnings;

use PVE::Storage::LVMPlugin;

BEGIN {
    no warnings 'redefine';

    my $properties = \&PVE::Storage::LVMPlugin::properties;
    my $options = \&PVE::Storage::LVMPlugin::options;
    *PVE::Storage::LVMPlugin::properties = sub {
        return {
            $properties->(@_)->%*,
            chunksize => {
                description => "LVM: how much a thin LV grows at a time.",
                type => 'string',
                format => 'disk-size',
            },
            'chunk-percentage' => {
                description => "LVM: the share of a chunk free when the LV is grown.",
                type => 'number',
                minimum => 0,
                maximum => 1,
            },
        };
    };
    *PVE::Storage::LVMPlugin::options = sub {
        return {
            $options->(@_)->%*,
            chunksize => { optional => 1 },
            'chunk-percentage' => { optional => 1 },
        };
    };
}

1;
