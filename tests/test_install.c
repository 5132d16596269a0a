/* cmake --install into a temporary prefix, then build and run a consumer
 * through pkg-config and through the CMake package, and the installed CLI. */
#include <check.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_util.h"

static char prefix[256];
static char tmp_dir[] = "/tmp/bp-install-XXXXXX";


static void install_once(void) {
  ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
  snprintf(prefix, sizeof prefix, "%s/prefix", tmp_dir);
  ck_assert_int_eq(sh("cmake --install '%s' --prefix '%s' >/dev/null", getenv("BP_BINARY_DIR"),
                      prefix),
                   0);
}

static void remove_tree(void) { sh("rm -rf '%s'", tmp_dir); }

START_TEST(pkg_config_consumer_builds_and_runs) {
  ck_assert_int_eq(sh(
           "PKG_CONFIG_PATH='%1$s/lib/pkgconfig' && export PKG_CONFIG_PATH && "
           "%2$s %3$s '%4$s/tests/install/consumer.c' -o '%1$s/consumer' "
           "$(pkg-config --cflags --libs blueprint) -Wl,-rpath,'%1$s/lib' && "
           "'%1$s/consumer' | grep -qx 'total_bytes=9635328'",
           prefix, BP_TEST_CC, BP_TEST_CFLAGS, getenv("BP_SOURCE_DIR")),
                   0);
}
END_TEST

START_TEST(cmake_package_consumer_builds_and_runs) {
  ck_assert_int_eq(sh(
           "cmake -S '%2$s/tests/install' -B '%1$s/consumer-build' -DCMAKE_PREFIX_PATH='%1$s' "
           "-DCMAKE_C_COMPILER=%3$s -DCMAKE_C_FLAGS='%4$s' -DCMAKE_EXE_LINKER_FLAGS='%4$s' "
           ">/dev/null && cmake --build '%1$s/consumer-build' >/dev/null && "
           "'%1$s/consumer-build/consumer' | grep -qx 'total_bytes=9635328'",
           prefix, getenv("BP_SOURCE_DIR"), BP_TEST_CC, BP_TEST_CFLAGS),
                   0);
}
END_TEST

START_TEST(installed_cli_and_models_work) {
  ck_assert_int_eq(sh("test -x '%s/bin/blueprint' && test -f '%s/include/blueprint/blueprint.h'",
                      prefix, prefix),
                   0);
  ck_assert_int_eq(sh("'%s/bin/blueprint' --help >/dev/null && test -f "
                      "'%s/share/blueprint/models/cnn.yaml'",
                      prefix, prefix),
                   0);
  /* the ABI headers a module builds against, and `plugins` with what is installed */
  ck_assert_int_eq(sh("test -f '%1$s/include/blueprint/abi/bp_abi.h' && "
                      "test -f '%1$s/include/blueprint/abi/bp_abi_device.h' && "
                      "test -f '%1$s/include/blueprint/abi/bp_abi_sdk.h' && "
                      "env -u BP_PLUGIN_PATH '%1$s/bin/blueprint' plugins >/dev/null",
                      prefix),
                   0);
  /* a prefix other than the configured one still finds its own modules:
   * <libdir>/blueprint/modules is also the directory beside the library */
  ck_assert_int_eq(sh("env -u BP_PLUGIN_PATH '%1$s/bin/blueprint' plugins | "
                      "grep -q \"loaded  *%1$s/lib/blueprint/modules/bp_ops_reference.so\"",
                      prefix),
                   0);
}
END_TEST

/* A module needs only the headers: blueprint-abi.pc gives them and says
 * where modules go (moduledir); the module links nothing from blueprint. */
START_TEST(headers_only_pkg_config_builds_a_module) {
  ck_assert_int_eq(sh(
           "PKG_CONFIG_PATH='%1$s/lib/pkgconfig' && export PKG_CONFIG_PATH && "
           "pkg-config --exists 'blueprint-abi >= 0.1' && "
           "! pkg-config --libs blueprint-abi | grep -q lblueprint && "
           "test \"$(realpath \"$(pkg-config --variable=moduledir blueprint-abi)\")\" = "
           "\"$(realpath '%1$s/lib')/blueprint/modules\" && "
           "test \"$(pkg-config --variable=moduledir blueprint)\" = "
           "\"$(pkg-config --variable=moduledir blueprint-abi)\" && "
           "%2$s %3$s -shared -fPIC %5$s -DABI_MODULE_IMPL='\"pc\"' "
           "'%4$s/tests/install/module/abi_module.c' -o '%1$s/pc_module.so' "
           "$(pkg-config --cflags --libs blueprint-abi) && "
           "'%1$s/bin/blueprint' plugins --plugin '%1$s/pc_module.so' | "
           "grep -q 'loaded  *%1$s/pc_module.so'",
           prefix, BP_TEST_CC, BP_TEST_CFLAGS, getenv("BP_SOURCE_DIR"),
           strcmp(BP_TEST_NO_UNDEFINED, "ON") == 0 ? "-Wl,--no-undefined" : ""),
                   0);
}
END_TEST

/* blueprint::abi in the CMake package, and BLUEPRINT_MODULE_DIR: a module
 * installed there is found by the installed blueprint without
 * BP_PLUGIN_PATH. */
START_TEST(headers_only_cmake_target_and_module_dir) {
  ck_assert_int_eq(sh(
           "cmake -S '%2$s/tests/install/module' -B '%1$s/module-build' "
           "-DCMAKE_PREFIX_PATH='%1$s' -DCMAKE_C_COMPILER=%3$s -DCMAKE_C_FLAGS='%4$s' "
           "-DCMAKE_MODULE_LINKER_FLAGS='%4$s' -DABI_MODULE_NO_UNDEFINED=%5$s >/dev/null && "
           "cmake --build '%1$s/module-build' >/dev/null && "
           "test \"$(realpath \"$(cat '%1$s/module-build/module_dir.txt')\")\" = "
           "\"$(realpath '%1$s/lib')/blueprint/modules\" && "
           "cmake --install '%1$s/module-build' >/dev/null && "
           "env -u BP_PLUGIN_PATH '%1$s/bin/blueprint' plugins | "
           "grep -q 'loaded  *%1$s/lib/blueprint/modules/abi_module.so'",
           prefix, getenv("BP_SOURCE_DIR"), BP_TEST_CC, BP_TEST_CFLAGS, BP_TEST_NO_UNDEFINED),
                   0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("install");
  TCase *tc = tcase_create("install");
  tcase_set_timeout(tc, 120);
  tcase_add_unchecked_fixture(tc, install_once, remove_tree);
  tcase_add_test(tc, pkg_config_consumer_builds_and_runs);
  tcase_add_test(tc, cmake_package_consumer_builds_and_runs);
  tcase_add_test(tc, installed_cli_and_models_work);
  tcase_add_test(tc, headers_only_pkg_config_builds_a_module);
  tcase_add_test(tc, headers_only_cmake_target_and_module_dir);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
