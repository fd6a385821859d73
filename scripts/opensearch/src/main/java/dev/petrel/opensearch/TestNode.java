package dev.petrel.opensearch;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.painless.PainlessPlugin;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * A single-node OpenSearch for tests: the distribution's server with only
 * the modules the tests use (HTTP, common analysis, painless), run from the
 * jars Maven fetched. Arguments: data directory, HTTP port, then any
 * {@code key=value} node settings (a tiny write queue, say).
 */
public final class TestNode extends Node {
    // The constructor that takes classpath plugins is protected: it is how
    // OpenSearch's own test framework embeds nodes.
    private TestNode(Environment env, List<Class<? extends Plugin>> plugins) {
        super(env, plugins, true);
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: TestNode DATA_DIR HTTP_PORT [key=value ...]");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("data"));
        Files.createDirectories(home.resolve("logs"));
        Files.createDirectories(home.resolve("config"));
        Settings.Builder s = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "petrel-test")
            .put("node.name", "petrel-test-node")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            // Port 0: any free transport port, nothing connects to it.
            .put("transport.port", "0")
            // Test machines are often nearly full: the disk watermarks
            // would make every index read-only.
            .put("cluster.routing.allocation.disk.threshold_enabled", false);
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                System.err.println("not key=value: " + args[i]);
                System.exit(2);
            }
            s.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        Environment env = InternalSettingsPreparer.prepareEnvironment(
            s.build(), Collections.emptyMap(), home.resolve("config"), () -> "petrel-test-node");
        TestNode node = new TestNode(env, List.of(Netty4Plugin.class, CommonAnalysisPlugin.class, PainlessPlugin.class));
        node.start();
        System.out.println("petrel-test-opensearch started on 127.0.0.1:" + args[1]);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                done.countDown();
            }
        }));
        done.await();
    }
}
